"""Moving in: routines read from django-celery-beat's tables, RedBeat's
Redis keys or a file, and written to our store in one transaction.

Each source module only reads its source and turns each entry into a
:class:`~celery_routines.operator.importers.plan.Planned` routine (validated by
``define``, the door ``@routine`` uses) or an ``Unmappable`` one with the
reason; :class:`~celery_routines.operator.importers.apply.Importer` decides
what to write and writes it whole or not at all.
"""
