"""Decoding itself: the data parts exchange, the protocol they speak to engines, samplers, scores, the decoder.

``types`` (slots, plans, commits, results), ``protocol`` (model calls and
their outputs), ``scores`` (lazy model outputs), ``sampling`` (samplers),
``checks`` (what parts hand back), ``counters`` (costs), ``decoder`` (the
generic plan-and-infill loop).
"""
