"""Models: the loader (`loader`), tiny offline test models (`tiny`), packaged real models (`packaged`),
and their one cache root (`cache`). Import the submodules directly; nothing heavy is imported here."""
