//! SVG Gantt charts (written by hand: no dependency).
