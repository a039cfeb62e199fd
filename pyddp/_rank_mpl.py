"""matplotlib's backend on ranks started from a notebook (``MPLBACKEND=module://pyddp._rank_mpl``):
Agg, whose ``show()`` sends the open figures to the kernel (pyddp._rank_io.flush_figures), which
displays them in the running cell; a rank that does not send its figures closes them.  The figures
still open when a cell (or notebook_launcher's function) ends are sent then, as IPython's inline
backend does."""
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

from . import _rank_io

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args, **kwargs):
    """Send every open figure to the kernel (and close them)."""
    _rank_io.flush_figures()
