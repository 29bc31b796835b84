"""Generation engines.

Generation engines behind one protocol (``base``: ``Engine``, ``SamplingParams``, the Hugging Face engine), the
prefix-caching engine (``kv_engine``), vLLM (``vllm_engine``, weights sync in ``weights``), the token-in/token-out
stream of an episode (``stream``), and chat models that are not the policy (``chat_model``: simulated users,
judges).

May import: envace.policy and the packages below it.
"""
