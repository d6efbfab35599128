"""Executors: how EngineCore reaches its worker(s)."""
