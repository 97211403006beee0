"""Training the SpecDec++ acceptance head (Huang et al., *SpecDec++*): its data
(``data``: the drafter's hidden states labelled by the target's acceptance) and
its training loop (``train``). The head itself is ``drafting.acceptance_head``;
saving and loading it, ``checkpoints.acceptance_heads``."""
