"""No views: the example is about the beats and the worker."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
