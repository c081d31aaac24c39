"""Atlas model family: MiniMax-M2 (full-width q/k norms, partial rotary, sigmoid-routed experts)."""
