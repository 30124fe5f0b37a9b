"""Server mode and serve-batch: the client, vLLM serve stats and frontend, batch files, uploads."""
