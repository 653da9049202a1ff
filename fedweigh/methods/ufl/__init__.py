"""UFL: MC-dropout sample uncertainty and the uncertainty-weighted loss (client), U-Agg weights (server)."""
