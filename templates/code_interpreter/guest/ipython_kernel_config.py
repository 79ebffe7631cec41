# IPython kernel configuration of code-interpreter-v1 (IPYTHONDIR/profile_default): plain
# tracebacks (the SDKs show them as text) and no truncation of long reprs.
c = get_config()  # noqa: F821 - provided by IPython when it loads this file
c.InteractiveShell.colors = "nocolor"
c.PlainTextFormatter.max_seq_length = 0
