"""How dataset files are laid out and read: VOC's devkit layout and XML annotations, COCO's JSON, the
problems a bad annotation can have (``annotations``), and where the synthetic set is cached.

Why a package of its own, below both ``study`` and ``data``: validation (``study``: does the data a
study names exist, and is it sound?) and the loaders (``data``) read the same files by the same rules.
When the parsers lived in ``study``, the data loaders imported from the study package, and a reader
looking for "how VOC XML is read" did not look there. Nothing here imports torch, pydantic
or the rest of the package (``wording`` and ``writable`` only).
"""
