"""The admin dashboard: a web page over the queue's Redis data, mounted by the gateway
under ``/admin`` or served alone by ``tokenq dashboard``.

Kept free of imports so that loading the CLI does not load the web stack: the router is
``producer.dashboard.routes.create_dashboard_router``, the app alone
``producer.dashboard.app.create_dashboard_app``, the command
``producer.dashboard.cli.dashboard``.
"""
