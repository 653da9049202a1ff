"""FedBuff (Nguyen et al.): a server step with the staleness-weighted mean of every K buffered updates."""
