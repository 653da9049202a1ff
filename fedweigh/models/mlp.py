"""Multilayer perceptron: the digits model, and UFL's Target-B MLP."""

from __future__ import annotations

import torch
from torch import nn

from fedweigh.models import options


class DigitsMLP(nn.Module):
    """Flatten -> (``fc<i>`` -> ReLU [-> Dropout]) per hidden layer -> last ``fc`` (logits).

    Sized by default for scikit-learn's ``load_digits`` (1x8x8 images, 64
    inputs, one hidden layer of 64), the project's fast CPU dataset, but any
    square image works. UFL's Target-B MLP is ``hidden=(128, 128),
    dropout=0.2`` (64-128-128-10 with Dropout(0.2) after each hidden layer).

    Parameters
    ----------
    num_classes : int, default 10
        Number of output logits.
    in_channels : int, default 1
        Channels of the input image.
    image_size : int, default 8
        Side length of the square input image.
    hidden : int or sequence of int, default 64
        Width of each hidden layer (keyword only; the option ``model-hidden``).
    dropout : float, default 0.0
        ``nn.Dropout`` after each hidden ReLU when positive (keyword only; the
        option ``model-dropout``).

    Attributes
    ----------
    probe_layer : str
        The last hidden linear layer (``fc1`` with one hidden layer); its
        output is taken before the ReLU.
    classifier_layer : str
        The final ``nn.Linear`` (``fc2`` with one hidden layer).

    Raises
    ------
    ValueError
        If ``hidden`` or ``dropout`` is not accepted.

    Examples
    --------
    >>> model = DigitsMLP(hidden=32)
    >>> model(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    >>> [name for name, _ in DigitsMLP(hidden=(128, 128), dropout=0.2).named_children()]
    ['flatten', 'fc1', 'relu1', 'dropout1', 'fc2', 'relu2', 'dropout2', 'fc3']
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        *,
        hidden: int | tuple[int, ...] = 64,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        sizes = options.hidden_sizes("mlp", hidden)
        p = options.dropout("mlp", dropout)
        self.flatten = nn.Flatten(start_dim=1)
        inputs = in_channels * image_size * image_size
        for index, size in enumerate(sizes, start=1):
            self.add_module(f"fc{index}", nn.Linear(inputs, size))
            self.add_module(f"relu{index}", nn.ReLU())
            if p > 0:
                self.add_module(f"dropout{index}", nn.Dropout(p))
            inputs = size
        self.add_module(f"fc{len(sizes) + 1}", nn.Linear(inputs, num_classes))
        self.probe_layer = f"fc{len(sizes)}"
        self.classifier_layer = f"fc{len(sizes) + 1}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map a batch ``[B, C, H, W]`` (or ``[B, C*H*W]``) to logits."""
        for layer in self.children():
            x = layer(x)
        return x
