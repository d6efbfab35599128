"""The unified token-budget scheduler."""
