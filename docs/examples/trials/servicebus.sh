# Microsoft's Service Bus emulator runs as a container (Docker; see "Test locally with the Azure
# Service Bus emulator" in Azure's docs). Start it with its default configuration, which has the
# queue queue.1, then point the connection at it: plain AMQP on localhost:5672, with the
# emulator's documented key.
export AIRFLOW_CONN_AZURE_SERVICE_BUS_DEFAULT='{"conn_type": "azure_service_bus",
  "schema": "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"}'
