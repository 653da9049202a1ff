"""FedOUI: each client's OUI on a probe batch (client), Beta-fit typicality weights (server)."""
