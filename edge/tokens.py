"""The prompt size of an OpenAI-style request body, estimated without a tokenizer.

``prompt`` as token ids counts exactly (what a tokenizing client sends); text counts one token per 4
characters (English BPE averages ~4 characters per token, the estimate vLLM's own docs use for sizing);
chat messages count their text plus 4 tokens each for the role and the template's separators. The edge
uses the estimate to price a request in seconds of prefill; a body it cannot size is still proxied (vLLM
decides whether it is valid) and is priced at the IU's mean request instead.
"""

from __future__ import annotations

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4


def text_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def _content_text(content) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only the text ones cost prefill we can estimate
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return None


def estimate_prompt_tokens(body: dict, chat: bool) -> int | None:
    """Prompt tokens of ``body`` (a decoded JSON object); None when the body has no prompt we can size."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        total = 0
        for message in messages:
            text = _content_text(message.get("content")) if isinstance(message, dict) else None
            if text is None:
                return None
            total += text_tokens(text) + CHAT_TOKENS_PER_MESSAGE
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt)
        if all(isinstance(p, str) for p in prompt):
            return sum(text_tokens(p) for p in prompt)
        if all(isinstance(p, list) for p in prompt):  # a batch of token-id prompts
            return sum(len(p) for p in prompt)
    return None


def prompt_parts(body: dict, chat: bool) -> list[str]:
    """The prompt text of ``body`` in order, for prefix hashing (edge/pool/prefix.py): each chat message as
    role + NUL + text + NUL, a completion's prompt string as is; empty when there is no text prompt."""
    if chat:
        messages = body.get("messages")
        parts = []
        for message in messages if isinstance(messages, list) else ():
            text = _content_text(message.get("content")) if isinstance(message, dict) else None
            if text is None:
                break  # what follows a part we cannot read is not a prefix we can match
            parts.append(f"{message.get('role', '')}\0{text}\0")
        return parts
    prompt = body.get("prompt")
    return [prompt] if isinstance(prompt, str) else []
