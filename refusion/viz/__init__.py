"""Pictures of a decode: when each position was committed (PNG, GIF, self-contained HTML)."""
