"""The admin: beat-claims entries, claims and runs under /admin/beat_claims/entry/."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
