"""Model and tokenizer loading (hub id, local folder, or the locally built tiny model)."""
