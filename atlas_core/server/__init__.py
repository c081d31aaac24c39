"""The HTTP server (`atlas serve`): a Litestar app speaking the OpenAI and Anthropic APIs (docs/server.md)."""
