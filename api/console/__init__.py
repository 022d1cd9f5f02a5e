"""The web console served by `flexai server` at ``/``: sign-in sessions in a cookie, the jobs
page, a job's page (spec, live logs, history, time travel, why it waits, loss chart,
checkpoints and outputs, stop and delete), the nodes page, their live streams (server-sent
events woken by the projector and the log followers: no thread per open page), the Jinja2
templates and the static CSS and JavaScript they use.
Imports: api.artifacts, api.http (its page cursors and streaming answers alone: modules that
import nothing of ours), api.identity, api.services, common, domain, projections."""
