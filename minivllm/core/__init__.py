"""EngineCore's CPU-side state: the KV block ledger and the scheduler."""
