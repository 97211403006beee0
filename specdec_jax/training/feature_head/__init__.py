"""Training a feature (EAGLE) draft head: cached target features (``data``),
the loss, the held-out acceptance per draft position and the run (``train``)."""
