"""The HTTP server (`atlas serve`): Litestar app speaking the OpenAI API."""
