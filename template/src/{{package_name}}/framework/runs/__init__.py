"""The life cycle of one run: its directory and lock, its checkpoints, its interrupts, its line in
the experiment record and the summary it ends with. ``directory`` imports nothing heavy, so that
scripts can use it without Lightning."""
