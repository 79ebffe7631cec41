"""IPython start-up of code-interpreter-v1 kernels: the result formats the Code Interpreter
SDKs read beyond IPython's own, and the data stack loaded before the first cell.

* ``e2b/data``: a pandas DataFrame as ``{column: [values...]}`` (JSON values: NaN is null,
  times are ISO strings), next to its usual text and HTML.
* ``e2b/chart``: a matplotlib figure described by the ``e2b_charts`` package, next to its
  PNG.
* ``application/json``: a dict or list that JSON can hold, next to its text.
* PIL images: ``show()`` and ``save(<path>)`` also display the image (as PNG).
"""


def _e2b_setup() -> None:
    import json
    import sys

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from IPython.display import display
    from traitlets import ObjectName, Unicode

    shell = get_ipython()
    if shell is None:
        return
    formatters = shell.display_formatter.formatters

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = dict

    class ChartFormatter(BaseFormatter):
        # Not by registration: matplotlib's inline backend removes every formatter's entry
        # for Figure whenever it (re)configures the figure formats.
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = dict

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")
            if figure is not None and isinstance(obj, figure.Figure):
                return figure_chart(obj)
            return None

    data = formatters["e2b/data"] = DataFormatter(parent=shell.display_formatter)
    formatters["e2b/chart"] = ChartFormatter(parent=shell.display_formatter)

    def frame_data(frame):
        return {
            str(column): json.loads(frame[column].to_json(orient="values", date_format="iso"))
            for column in frame.columns
        }

    def figure_chart(figure):
        try:
            from e2b_charts import chart_figure_to_dict

            return chart_figure_to_dict(figure) or None
        except Exception:  # noqa: BLE001 - a figure it cannot describe still shows as PNG
            return None

    def plain_json(value):
        try:
            return json.loads(json.dumps(value, default=_scalar)), {"expanded": True}
        except (TypeError, ValueError):
            return None

    # By the class itself: pandas 3 names DataFrame's module "pandas", so a lookup by
    # module and name would depend on the version. Both are loaded below anyway.
    try:
        import pandas

        data.for_type(pandas.DataFrame, frame_data)
    except ImportError:
        pass
    formatters["application/json"].for_type(dict, plain_json)
    formatters["application/json"].for_type(list, plain_json)

    try:
        from PIL import Image
    except ImportError:
        return
    save = Image.Image.save

    def show(self, *args, **kwargs):
        display(self)

    def save_and_show(self, fp, *args, **kwargs):
        if isinstance(fp, str):
            display(self)
        return save(self, fp, *args, **kwargs)

    Image.Image.show = show
    Image.Image.save = save_and_show


def _scalar(value):
    """numpy scalars and arrays as their Python values; anything else cannot be JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(type(value).__name__)


_e2b_setup()
del _e2b_setup

# Loaded before the first cell, so that a new sandbox's first import is instant.
import matplotlib.pyplot  # noqa: E402,F401
import numpy  # noqa: E402,F401
import pandas  # noqa: E402,F401
