"""Building blocks shared by the models: norms, rotary embeddings, activations, merged linears."""
