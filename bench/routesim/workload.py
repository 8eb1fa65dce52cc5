"""The production request mix lives in :mod:`sim.vllm.workload` (the demo's edge uses it too)."""

from sim.vllm.workload import (  # noqa: F401
    MAX_MODEL_LEN,
    MAX_OUTPUT,
    PRODUCTION_MIX,
    RequestClass,
    TraceRequest,
    draw_request_shape,
    mean_shape,
    poisson_trace,
)
