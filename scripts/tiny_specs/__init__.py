"""One module per model family, each exporting ``SPECS: list[Spec]`` (see `tiny_checkpoint_specs`)."""
