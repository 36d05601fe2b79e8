"""Following many request streams on few Redis connections (clients and gateway)."""
