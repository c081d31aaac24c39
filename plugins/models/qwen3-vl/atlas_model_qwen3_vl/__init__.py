"""Atlas model family: Qwen3-VL (vision-language)."""
