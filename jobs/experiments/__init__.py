"""Research experiments built on the package's public API: the demo's pipeline, recipe sweeps, latent probes."""
