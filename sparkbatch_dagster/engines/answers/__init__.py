"""What an answer is made of, for any backend: one-step labels, confidence, reasoning, sampling.

Modules: :mod:`.plan` (what one generate call decides for its requests: sampling, the labels'
one step and its tally, the confidence scorer, the reasoning; both backends ask it),
:mod:`.label_tokens` (the label set as token ids, one decoding step per label),
:mod:`.confidence` (a label's confidence from its log-probabilities), :mod:`.reasoning` (the
reasoning plan: thinking budget, parser, template switches) and :mod:`.encode_ahead` (prompts
tokenized ahead of the engine, in a thread of their own) and :mod:`.extras` (what an answer
carries beyond its text when its request asks: the stop string, choices, log-probabilities)
and :mod:`.tools` (a batch line's tool calls, read from its answer).

May import: ``errors``, ``spec``, ``home``; ``engines`` base modules and :mod:`..platform`.
"""
