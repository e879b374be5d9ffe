"""The data: shards written and read, the training and eval loaders, GPU JPEG decoding, the tokenizer."""
