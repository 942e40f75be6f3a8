"""The plugin machinery: the hook specifications (``hookspecs``), the records a registration hook returns, each kind
declared once (``specs``), discovery through entry points (``registry``), selecting the components a config names or
enables (``selection``) and the core's own plugin (``builtin``: the algorithms, rule-based rewards, environments
and loggers, registered through the same hooks as any other)."""
