"""Reading other trainers' and tools' records into a store (the command line is storage/io.py;
the generic JSONL format itself is storage/interchange.py, which export writes too).

    registry        the format protocol (``Format``) and ``@register``
    formats         the catalogue: every format module, ``get``, ``detect``
    door            the framework every door reads through: one item fails alone, bounds,
                    folders (links out refused), numbers and token ids
    files           import a file or folder (``import_file``, ``import_runs``): the entry point
    generic         the generic JSONL format
    dumps           verl rollout dumps (and the rules TRL's logs share); trl_dumps: TRL
    messages        OpenAI-style ``messages`` JSONL from any agent framework
    art_logs        OpenPipe ART's trajectory logs
    verifiers_traces  verifiers' traces.jsonl
    inspect_log     Inspect AI ``.eval`` / ``.json`` logs, read with the standard library
    inspect_scores  Inspect's score values as reward components
    inspect_import  one run per task and model of an Inspect log
    zip_members     bounded reading of zip members
    import_batch    each batch written in one transaction; an import's run row
    report          what an import did
    follow          follow a folder another trainer writes into (tail, feed, pollers;
                    follow_logs: Inspect logs as an evaluation writes them)
"""
from storage.ingest.files import FORMATS, IMPORT_FORMATS, guess_format, import_file, import_runs
from storage.ingest.follow import follow
from storage.interchange import to_rows
from storage.ingest.report import ImportReport, default_run_id

__all__ = ["FORMATS", "IMPORT_FORMATS", "ImportReport", "default_run_id", "follow",
           "guess_format", "import_file", "import_runs", "to_rows"]
