"""OpenAI-compatible serving of a RecursiveMAS system on Ray Serve (`jobs/serve.py`, `cluster/serve.yaml`).

`config.py` holds `ServeConfig` (no Ray import, so `--help` is instant); `app.py` the FastAPI ingress and
the Serve deployment; `openai_api.py` the request checks and response bodies, free of Ray and FastAPI.
"""
