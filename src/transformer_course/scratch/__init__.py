"""Each model of the course written from scratch, whole, in one torch-only file: the code a learner types.

One file per family, in forward order, importing nothing but ``math``, ``torch``, ``torch.nn`` and
``torch.nn.functional`` (never the package): no caches, no input validation, no device logic, a shape
comment at every reshape, and the book's symbols as names.

* ``scratch.attention``: one self-attention head and the multi-head layer (the heads side by side, then
  ``W_o``);
* ``scratch.gpt``: a decoder-only GPT with a tied head, its training step and ``generate``;
* ``scratch.seq2seq``: the encoder-decoder transformer with cross-attention and greedy decoding;
* ``scratch.vit``: the vision transformer (patches, class token, encoder, head);
* ``scratch.bert``: the masked language model (corruption, encoder, loss).

The package's classes are the hardened versions of the same models (caches, checks, clear errors, fused
kernels). The scratch files repeat on purpose what the package computes; ``tests/test_scratch*.py`` load
the package's weights into each scratch model by name and prove the two equal in float64, so that they
stay one implementation in meaning. Import a file as ``from transformer_course.scratch import gpt``.
"""
