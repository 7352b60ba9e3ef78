"""Local Hugging Face backends: sentence-transformers embeddings and transformers text generation."""
