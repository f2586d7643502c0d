"""Template tags of the admin's dashboard."""

from dataclasses import dataclass

from django import template

from kb.admin.common import progress_bar, status_badge
from kb.models import Document
from kb.selectors.admin import Dashboard, DayCount, dashboard

register = template.Library()

CHART_WIDTH, CHART_HEIGHT, CHART_GAP, CHART_LABEL_SPACE = 560, 120, 4, 18


@dataclass(frozen=True)
class Bar:
    day: DayCount
    x: float
    y: float
    width: float
    height: float
    label_x: float
    show_label: bool

    @property
    def empty(self) -> bool:
        return self.day.documents == 0


@register.simple_tag
def kb_dashboard() -> Dashboard:
    return dashboard()


@register.simple_tag
def kb_chart_bars(per_day: list[DayCount]) -> list[Bar]:
    """Bars of the documents-per-day chart, scaled to the busiest day; every other day labelled."""
    if not per_day:
        return []
    peak = max(day.documents for day in per_day) or 1
    slot = CHART_WIDTH / len(per_day)
    plot_height = CHART_HEIGHT - CHART_LABEL_SPACE
    bars = []
    for position, day in enumerate(per_day):
        # An empty day still gets a sliver, so that every day of the range is visible.
        height = max(plot_height * day.documents / peak, 1.5)
        bars.append(
            Bar(
                day=day,
                x=position * slot + CHART_GAP / 2,
                y=plot_height - height,
                width=slot - CHART_GAP,
                height=height,
                label_x=position * slot + slot / 2,
                show_label=(len(per_day) - 1 - position) % 2 == 0,
            )
        )
    return bars


@register.simple_tag
def kb_status(document: Document) -> str:
    return status_badge(
        doc_id=document.pk, status=document.status, error_code=document.error_code, error=document.error
    )


@register.simple_tag
def kb_progress(document: Document) -> str:
    return progress_bar(doc_id=document.pk, embedded=document.embedded_count, total=document.chunk_count)
