"""``intdet compress`` / ``decompress``: text compression with the integer
model's next-token probabilities, decodable on any machine (docs/compress.md).

table.py: the integer probability table (spec); rangecoder.py: the range
coder (spec); container.py: the file format; chunking.py: input -> chunks ->
token ids; codec.py: the model-driven encoder and batched decoder.
"""
