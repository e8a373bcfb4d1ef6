"""Tasks of the example schedule. Each logs one line so the worker log can be counted."""

import time

from celery import shared_task
from celery.utils.log import get_task_logger

logger = get_task_logger(__name__)


@shared_task
def heartbeat() -> str:
    logger.info("heartbeat ran")
    return "ok"


@shared_task
def minutely_report() -> str:
    logger.info("minutely_report ran")
    return "report"


@shared_task
def slow_report(seconds: float = 12.0) -> str:
    logger.info("slow_report started")
    time.sleep(seconds)
    logger.info("slow_report finished")
    return "slow report"
