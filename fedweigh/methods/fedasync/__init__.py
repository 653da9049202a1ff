"""FedAsync (Xie et al.): each arrival mixed into the model, discounted by its staleness."""
