"""The beat side, one concern per object; :class:`beat_claims.scheduler.Scheduler` wires
them into Celery's scheduler interface.

``clock``           "now" by the store, advanced by the monotonic clock
``liveness``        the heartbeat, the owners alive, the store's epoch
``knowledge``       what this beat knows of each entry, to refuse going back and to re-seed
``holdings``        claims this beat holds and has not handed to the broker (a hint)
``claimer``         the heap of due instants, and claiming what is due
``sender``          the check before publish, the sent mark, releases, giving back at stop
``publisher``       the message of a claimed occurrence; its arguments masked in errors
``pinned``          claims sent with the entry they were made with, whatever changed since
``policies``        each entry's policy, and the shortest windows over them (sweep bounds)
``stored``          the store's definitions, followed through the change feed
``composition``     which entries this beat schedules, and by which definition
``window``          the dynamic entries due soon, found in the store's due index
``dynamic``         those dynamic entries held while due soon: taken in, and let go
``sweeper``         taking back claims nobody serves, picking up due runs, presuming runs lost
``recovery``        outcomes no worker reported, from the result backend
``pauses``          the pauses this beat knows, checked against the store, restored if lost
``reregistration``  what this beat knows, registered again when the store lost writes
``outage``          logging an outage once, and the backoff
``stop_signals``    stop signals held while a beat gives back; who stops or builds it
"""
