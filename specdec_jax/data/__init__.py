"""Real corpora and benchmark prompts, fetched from package registries as plain files."""
