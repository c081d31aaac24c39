"""One model replica split over several ranks (tensor and expert parallelism).

`settings` holds what every rank is started with; a rank joins its replica in `world`; rank 0 posts
each step to the other ranks through `mirror`; they run it in `worker`; `replica` starts and watches
them on rank 0's side (`load_engine_model`). What each rank holds is `atlas_core.model.sharding`.
"""
