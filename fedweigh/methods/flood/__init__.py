"""FLood: energy-score sample weights ASW (client) and OOD-confidence aggregation DAC (server), a plug-in."""
