"""Which IUs one request may not use, decided once when it arrives and kept for every attempt it makes.

- By model: the IUs whose Consul ``Meta.model`` declares another model than the request's (an IU that declares
  none takes any model: vLLM answers for the name); no IU for the model at all is the proxy's 404.
- By rollout revision: under a traffic rollout the request is given the stable or the canary side
  (:mod:`edge.rollout`: by its session key's hash, else its request key's, else by the credit counter) and the
  other side's IUs are
  added, so its retry stays on its revision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.proxy import EdgeState

MODELS_CACHED = 64


def excluded(state: EdgeState, model: str | None, session: bytes | None = None, by: str = "session"
             ) -> frozenset[str] | None:
    """The IUs the request may not use; None when no registered IU serves ``model``. ``session`` and ``by``:
    the request's digest and how it was made (``edge.rollout.placement_of``)."""
    not_serving = _not_serving(state, model)
    return None if not_serving is None else state.rollout.split(state.view.snapshot(), not_serving, session, by)


def _not_serving(state: EdgeState, model: str | None) -> frozenset[str] | None:
    """The IUs that declare another model than ``model`` (empty: none do, or the request names none); None
    when every registered IU declares its model and none is ``model``."""
    models = state.view.unit_models()
    if not model or not models:
        return frozenset()
    seen, by_model = state.not_serving_of
    # a new Consul answer invalidates the sets; the model field is the client's, so it cannot grow them
    if seen is not models or len(by_model) >= MODELS_CACHED:
        by_model = {}
        state.not_serving_of = (models, by_model)
    if model not in by_model:
        by_model[model] = _not_serving_in(models, model)
    return by_model[model]


def _not_serving_in(models: dict[str, str | None], model: str) -> frozenset[str] | None:
    if model in models.values():
        return frozenset(iu for iu, served in models.items() if served is not None and served != model)
    if None in models.values():  # some IUs take any model: vLLM answers for the name
        return frozenset(iu for iu, served in models.items() if served is not None)
    return None

