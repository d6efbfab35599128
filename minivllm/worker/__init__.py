"""The device side: Worker, GPUModelRunner, InputBatch."""
