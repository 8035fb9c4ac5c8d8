"""tinygrad's NIR renderer class, for `isinstance` checks only: tgrad has no NIR backend."""

from tinygrad.renderer import Renderer


class NIRRenderer(Renderer):
    pass
