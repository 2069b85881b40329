"""The resize families, one module each: its policy (settings, identity,
the processor's size arithmetic) and its readers of processor configs.
:mod:`pixelwire.resize.registry` names the processors each one reads."""
