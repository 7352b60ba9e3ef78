"""Anthropic's Messages API (online) and Message Batches, as the `anthropic` provider (provider.py)."""
