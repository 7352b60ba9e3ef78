"""Provider tests use the session fixtures of tests/conftest.py (`llama_server`, `s3_server`); helpers live in
their own modules (llama_server.py, fault_proxy.py)."""
