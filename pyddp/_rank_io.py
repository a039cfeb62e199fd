"""What ranks started from a notebook show in the kernel besides their text: figures, display() and
progress bars; shared by notebook_launcher (forked ranks) and Ranks (persistent ranks).

    rank                                         kernel (Presenter)
    -------------------------------------------  -----------------------------------------------
    stdout / stderr (pipes)                  ->  "[rankN]: " + each line; a line redrawn with \\r
                                                 (tqdm) is one updating line: a display_data
                                                 output updated in place in a Jupyter kernel,
                                                 "\\r[rankN]: ..." rewritten in a terminal
    messages ("display", data, metadata, ...)->  IPython.display.publish_display_data (or, outside
      - display() / IPython's display_pub         IPython, the text/plain form and a line saying
      - matplotlib figures on plt.show() and      where the images went)
        at the end of a cell / of fn (the
        pyddp._rank_mpl backend, Agg inside)

A rank sends its messages through ``send``, given by its launcher (the persistent ranks' socket,
notebook_launcher's message pipe); stdout and stderr are flushed first, so text printed before a
display() shows before it.  Standard library only at import: IPython and matplotlib are used only
when the code on the ranks (or the kernel) has loaded them.
"""
import base64
import codecs
import collections
import os
import signal
import sys
import threading
import time
import uuid

__all__ = ["Presenter", "install", "flush_figures", "display", "MPL_BACKEND"]

# matplotlib's backend on the ranks: Agg, whose show() sends the figures to the kernel.
MPL_BACKEND = "module://pyddp._rank_mpl"

# How often (seconds) a line redrawn with \r is updated in the kernel at most.
_LIVE_EVERY = 0.1
# Lines of a quiet rank's stderr kept to show if that rank fails.
_HELD_LINES = 200


# ------------------------------------------------------------------------------------- rank side

class _RankState:
    send = None          # callable(message) or None: not on a rank started from a notebook
    rank = 0
    figures = True       # whether this rank sends its figures (the others close them unseen)
    lock = threading.Lock()


_state = _RankState()


def install(send, rank, figures=True, shell=None):
    """Called by a rank at start: messages go through ``send``; ``figures``: whether this rank's
    matplotlib figures are sent.  ``shell``: the forked kernel's InteractiveShell (notebook_launcher),
    whose display publisher is replaced (its own would write to the kernel's ZeroMQ sockets from a
    process that does not own them); without one (a fresh interpreter) IPython.display.display is
    replaced when IPython is imported."""
    _state.send = send
    _state.rank = rank
    _state.figures = bool(figures)
    if shell is not None:
        shell.display_pub = _Publisher()
        # tqdm.auto and friends check for a kernel's config to choose ipywidgets, whose comms
        # cannot work from here: in this (forked) process the shell is not a kernel's
        try:
            shell.config.pop("IPKernelApp", None)
        except Exception:
            pass
    else:
        _hook_ipython_display()
    _use_rank_backend()


def set_figures(figures):
    _state.figures = bool(figures)


def _use_rank_backend():
    mpl = sys.modules.get("matplotlib")
    if mpl is None:
        os.environ["MPLBACKEND"] = MPL_BACKEND
        return
    try:
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].switch_backend(MPL_BACKEND)
        else:
            mpl.use(MPL_BACKEND, force=True)
    except Exception:   # an unusual matplotlib: its figures stay on the rank
        pass


def send(message):
    """Send a message to the kernel: stdout and stderr first, so that the order is kept; SIGINT is
    held meanwhile, so that an interrupt cannot cut a message in half."""
    if _state.send is None:
        return False
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass
    blocked = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    if blocked:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _state.lock:
            _state.send(message)
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return True


def _figure_bundle(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    w, h = fig.get_size_inches() * fig.dpi
    text = f"<Figure size {w:g}x{h:g} with {len(fig.axes)} Axes>"
    return {"image/png": buf.getvalue(), "text/plain": text}, {}


def flush_figures():
    """Send every open pyplot figure (when this rank sends its figures) and close them all; what
    plt.show() does on a rank, and what runs at the end of a cell or of notebook_launcher's fn."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return 0
    from matplotlib._pylab_helpers import Gcf

    sent = 0
    for manager in list(Gcf.get_all_fig_managers()):
        fig = manager.canvas.figure
        try:
            if _state.figures and _state.send is not None:
                data, md = _figure_bundle(fig)
                send(("display", data, md, None, False))
                sent += 1
        finally:
            plt.close(fig)
    return sent


def _format(obj, include=None, exclude=None):
    """(data, metadata) of ``obj``: matplotlib figures as PNG, otherwise IPython's formatters
    (the forked kernel's, or a fresh DisplayFormatter), or the _repr_*_ methods without IPython."""
    mpl_figure = sys.modules.get("matplotlib.figure")
    if mpl_figure is not None and isinstance(obj, mpl_figure.Figure):
        return _figure_bundle(obj)
    if "IPython" in sys.modules:
        try:
            from IPython.core.interactiveshell import InteractiveShell

            if InteractiveShell.initialized():
                return InteractiveShell.instance().display_formatter.format(
                    obj, include=include, exclude=exclude)
            from IPython.core.formatters import DisplayFormatter

            return DisplayFormatter().format(obj, include=include, exclude=exclude)
        except Exception:
            pass
    data, md = {}, {}
    bundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(bundle):
        try:
            got = bundle(include=include, exclude=exclude)
            if isinstance(got, tuple):
                got, md = got[0], dict(got[1] or {})
            data.update(got or {})
        except Exception:
            pass
    for meth, mime in (("_repr_html_", "text/html"), ("_repr_png_", "image/png"),
                       ("_repr_jpeg_", "image/jpeg"), ("_repr_svg_", "image/svg+xml"),
                       ("_repr_markdown_", "text/markdown"), ("_repr_latex_", "text/latex"),
                       ("_repr_json_", "application/json")):
        f = getattr(obj, meth, None)
        if mime in data or not callable(f) or isinstance(obj, type):
            continue
        try:
            got = f()
        except Exception:
            continue
        if isinstance(got, tuple):
            got, extra = got
            md[mime] = extra
        if got is not None:
            data[mime] = got
    data.setdefault("text/plain", repr(obj))
    return data, md


def display(*objs, include=None, exclude=None, metadata=None, transient=None, display_id=None,
            raw=False, clear=False, update=False, **kwargs):
    """IPython.display.display on a rank: each object's representations go to the kernel, which
    displays them in the running cell.  Returns None (display handles are the kernel's)."""
    if _state.send is None:
        print(*objs)
        return None
    transient = dict(transient or {})
    if display_id:
        transient["display_id"] = uuid.uuid4().hex if display_id is True else display_id
    for obj in objs:
        if raw:
            data, md = dict(obj), {}
        else:
            data, md = _format(obj, include, exclude)
            if not data:
                continue
        if metadata:
            md = dict(md, **metadata)
        send(("display", data, md, transient or None, bool(update)))
    return None


class _Publisher:
    """The forked kernel's display publisher on a notebook_launcher rank: display() and
    publish_display_data() there send to the kernel instead of its ZeroMQ sockets."""

    is_publishing = False

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        send(("display", dict(data), dict(metadata or {}), transient, bool(update)))

    def clear_output(self, wait=False):
        pass

    def set_parent(self, parent):
        pass


def _patch_display_module(module):
    if getattr(module, "_pyddp_forwarded", False):
        return
    module.display = display
    module._pyddp_forwarded = True


class _AfterImport:
    """A meta path finder that replaces IPython's display() on a rank once IPython is imported
    (so that ranks which never use IPython never import it)."""

    NAME = "IPython.core.display_functions"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.NAME:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _patch_display_module(module)

        loader.exec_module = exec_module
        return spec


def _hook_ipython_display():
    mod = sys.modules.get(_AfterImport.NAME)
    if mod is not None:
        _patch_display_module(mod)
        for name in ("IPython.display", "IPython.core.display", "IPython"):
            if name in sys.modules:
                setattr(sys.modules[name], "display", display)
        return
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


# ---------------------------------------------------------------------- logging of the kernel

def logging_snapshot():
    """The kernel's console logging, to be mirrored on fresh-interpreter ranks: for the root logger
    and every named logger with a level or handlers, its level, propagate flag and the handlers that
    write to this process's stdout or stderr (stream, level, format, date format, style).  None when
    logging was not imported."""
    logging = sys.modules.get("logging")
    if logging is None:
        return None
    streams = {id(sys.stdout): "stdout", id(sys.stderr): "stderr"}
    styles = {logging.PercentStyle: "%", logging.StrFormatStyle: "{", logging.StringTemplateStyle: "$"}
    out = []
    loggers = [("", logging.getLogger())] + [
        (name, lg) for name, lg in sorted(logging.Logger.manager.loggerDict.items())
        if isinstance(lg, logging.Logger)]
    for name, lg in loggers:
        handlers = []
        for h in lg.handlers:
            which = streams.get(id(getattr(h, "stream", None)))
            if which is None or not isinstance(h, logging.StreamHandler) or \
                    isinstance(h, logging.FileHandler):
                continue
            f = h.formatter
            fmt = None if f is None else (f._fmt, f.datefmt, styles.get(type(f._style), "%"))
            handlers.append((which, h.level, fmt))
        if handlers or lg.level != logging.NOTSET:
            out.append((name, lg.level, lg.propagate, tuple(handlers)))
    return tuple(out)


_mirrored = {"snapshot": None, "handlers": []}


def apply_logging(snapshot):
    """On a rank: make its console logging the kernel's (``logging_snapshot()``): the handlers go to
    the rank's stdout / stderr, whose lines the kernel prints with the rank's prefix."""
    if snapshot is None or snapshot == _mirrored["snapshot"]:
        return
    import logging

    for lg, h in _mirrored["handlers"]:
        lg.removeHandler(h)
    _mirrored["handlers"] = []
    for name, level, propagate, handlers in snapshot:
        lg = logging.getLogger(name or None)
        lg.setLevel(level)
        if name:
            lg.propagate = propagate
        for which, hlevel, fmt in handlers:
            h = logging.StreamHandler(sys.stdout if which == "stdout" else sys.stderr)
            h.setLevel(hlevel)
            if fmt is not None:
                h.setFormatter(logging.Formatter(fmt[0], fmt[1], style=fmt[2]))
            lg.addHandler(h)
            _mirrored["handlers"].append((lg, h))
    _mirrored["snapshot"] = snapshot


def redirect_logging(old_streams, new_stdout, new_stderr):
    """On a forked rank: the kernel's logging handlers that wrote to the kernel's stdout / stderr
    (objects that send over the kernel's sockets, useless here) write to the rank's instead."""
    logging = sys.modules.get("logging")
    if logging is None:
        return
    olds = {id(s): which for s, which in old_streams if s is not None}
    loggers = [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for h in lg.handlers:
            which = olds.get(id(getattr(h, "stream", None)))
            if which is None and type(getattr(h, "stream", None)).__name__ == "OutStream":
                which = getattr(h.stream, "name", None)   # another of ipykernel's streams
            if which in ("stdout", "stderr") and isinstance(h, logging.StreamHandler):
                try:
                    h.setStream(new_stdout if which == "stdout" else new_stderr)
                except Exception:
                    pass


# ----------------------------------------------------------------------------------- kernel side

def _shell():
    """The running IPython kernel's shell, or None (plain Python, or a terminal IPython)."""
    ipy = sys.modules.get("IPython")
    if ipy is None:
        return None
    try:
        ip = ipy.get_ipython()
    except Exception:
        return None
    return ip if ip is not None and getattr(ip, "kernel", None) is not None else None


def _b64(data):
    out = {}
    for k, v in data.items():
        if isinstance(v, (bytes, bytearray)):
            v = base64.b64encode(bytes(v)).decode("ascii")
        out[k] = v
    return out


class _Stream:
    __slots__ = ("decoder", "pending", "live", "live_text", "live_at", "is_err", "rank", "stale")

    def __init__(self, rank, is_err):
        self.rank = rank
        self.is_err = is_err
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""        # text of the current line not printed yet
        self.live = None         # the display id (kernel) or True (terminal) of an updating line
        self.live_text = None
        self.live_at = 0.0
        self.stale = False       # live_text is newer than what is shown


def _visible(line):
    """What a terminal shows of a line redrawn with carriage returns: its last non-empty redraw."""
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""


def read_available(fd, most=64):
    """What the non-blocking ``fd`` holds now (at most ``most`` reads of 64 KiB: a rank that
    writes without a pause does not hold the kernel here), as (chunks, whether it reached its
    end)."""
    chunks = []
    while len(chunks) < most:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return chunks, False
        except (OSError, ValueError):
            return chunks, True
        if not chunk:
            return chunks, True
        chunks.append(chunk)
    return chunks, False


class Presenter:
    """The kernel's end: prints the ranks' text with their prefix, renders lines redrawn with \\r
    (progress bars) as one updating line, and shows what the ranks displayed.

    ``quiet_others``: only rank 0's text and displays are shown; the others' stderr is kept (the
    last lines) and shown by ``reveal(rank)`` when that rank fails."""

    def __init__(self, quiet_others=False, longest_line=1 << 16,
                 elsewhere="shown only in a Jupyter kernel"):
        self.quiet_others = quiet_others
        self.elsewhere = elsewhere
        self.longest_line = longest_line
        self.streams = {}
        self.held = collections.defaultdict(lambda: collections.deque(maxlen=_HELD_LINES))
        self.displayed = []      # (rank, data, metadata) of every display message, in order
        self._term_live = None   # the stream whose updating line a terminal shows now

    def _quiet(self, rank):
        return self.quiet_others and rank != 0

    def _stream(self, rank, is_err):
        key = (rank, is_err)
        s = self.streams.get(key)
        if s is None:
            s = self.streams[key] = _Stream(rank, is_err)
        return s

    @staticmethod
    def _out(is_err):
        return sys.stderr if is_err else sys.stdout

    # ---------------------------------------------------------------- text
    def feed(self, rank, is_err, data, final=False):
        """Bytes a rank wrote to its stdout (or stderr); ``final``: its pipe closed, or the caller
        wants everything shown now."""
        s = self._stream(rank, is_err)
        text = s.pending + s.decoder.decode(data, final=final)
        lines = text.split("\n")
        s.pending = lines.pop()
        if lines:
            self._lines(s, lines)
        if s.pending:
            if "\r" in s.pending:
                # keep only the last redraw (a progress bar never ends its line until it closes)
                head, _, tail = s.pending.rpartition("\r")
                shown = _visible(head + "\r" + tail) if tail else _visible(head)
                s.pending = "\r" + tail
                if shown:
                    self._update_live(s, shown)
            if final or len(s.pending) > self.longest_line:
                self._lines(s, [s.pending])
                s.pending = ""

    def _lines(self, s, lines):
        if self._quiet(s.rank):
            if s.is_err:
                self.held[s.rank].extend(_visible(l) for l in lines)
            return
        if s.live is not None:   # the updating line ends with the first finished line
            self._end_live(s, _visible(lines[0]))
            lines = lines[1:]
            if not lines:
                return
        self._break_terminal_line()
        out = self._out(s.is_err)
        out.write("".join(f"[rank{s.rank}]: {_visible(l)}\n" for l in lines))

    def _update_live(self, s, text, force=False):
        if self._quiet(s.rank):
            return
        now = time.monotonic()
        if s.live is not None and not force and now - s.live_at < _LIVE_EVERY:
            s.live_text = text   # shown by tick(), at the next update or when the line ends
            s.stale = True
            return
        s.live_text, s.live_at, s.stale = text, now, False
        line = f"[rank{s.rank}]: {text}"
        shell = _shell()
        if shell is not None:
            from IPython.display import display as ipy_display, update_display

            self.flush()
            if s.live is None:
                s.live = uuid.uuid4().hex
                ipy_display({"text/plain": line}, raw=True, display_id=s.live)
            else:
                update_display({"text/plain": line}, raw=True, display_id=s.live)
        else:
            if self._term_live is not None and self._term_live is not s:
                self._break_terminal_line()
            s.live = True
            self._term_live = s
            out = self._out(s.is_err)
            out.write("\r" + line)
            out.flush()

    def _end_live(self, s, text):
        text = text or s.live_text or ""
        if isinstance(s.live, str):
            self._update_live(s, text, force=True)
            s.live = None
        else:
            out = self._out(s.is_err)
            if self._term_live is s:
                out.write(f"\r[rank{s.rank}]: {text}\n")
                self._term_live = None
            else:
                out.write(f"[rank{s.rank}]: {text}\n")
            s.live = None
        s.live_text = None
        s.stale = False

    def _break_terminal_line(self):
        """A terminal shows an updating line: end it (it stays as it was) before other output."""
        s = self._term_live
        if s is not None:
            self._out(s.is_err).write("\n")
            self._out(s.is_err).flush()
            s.live = None
            self._term_live = None

    def tick(self):
        """Show the latest redraw of updating lines held back by the rate limit (a bar that stopped
        moving shows where it stopped)."""
        now = time.monotonic()
        for s in self.streams.values():
            if s.stale and s.live is not None and now - s.live_at >= _LIVE_EVERY:
                self._update_live(s, s.live_text, force=True)

    def finish(self, rank=None):
        """Print what is left of the ranks' lines (all ranks, or one) and end updating lines."""
        for (r, _), s in list(self.streams.items()):
            if rank is not None and r != rank:
                continue
            self.feed(r, s.is_err, b"", final=True)
            if s.live is not None:
                self._end_live(s, s.live_text)
        self.flush()

    def flush(self):
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass

    def reveal(self, rank):
        """Show the stderr lines of a quiet rank (one that failed)."""
        held = self.held.pop(rank, None)
        if not held:
            return
        self._break_terminal_line()
        sys.stderr.write(f"[rank{rank}]: (its last stderr lines, held back by quiet_others:)\n"
                         + "".join(f"[rank{rank}]: {l}\n" for l in held))
        self.flush()

    # ---------------------------------------------------------------- displays
    def show(self, rank, message):
        """A message a rank sent: ("display", data, metadata, transient, update)."""
        if not message or message[0] != "display":
            return
        _, data, md, transient, update = (tuple(message) + (None, None, None, None))[:5]
        self.displayed.append((rank, data, md))
        if self._quiet(rank):
            return
        self._break_terminal_line()
        self.flush()
        shell = _shell()
        if shell is not None:
            from IPython.display import publish_display_data

            kw = {}
            if transient:
                kw["transient"] = transient
            if update:
                kw["update"] = True
            publish_display_data(data=_b64(data), metadata=md or {}, **kw)
            return
        text = data.get("text/plain", "")
        others = sorted(k for k in data if k != "text/plain")
        note = f" ({', '.join(others)} {self.elsewhere})" if others else ""
        sys.stdout.write("".join(f"[rank{rank}]: {line}\n" for line in
                                 (str(text) + note).split("\n")))
        sys.stdout.flush()
