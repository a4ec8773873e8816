"""``warmgate simulate``: a request trace replayed through warmgate's own decision code on a
virtual clock, with simulated backends; the cost of each configuration side by side
(docs/simulate.md)."""
